"""A multi-host testbed for the presence service: network namespaces as hosts, `ray up
ray_cluster.yaml` over SSH, HAProxy in front of the edges, scenarios with real websocket watchers
judged by the history checker. `python -m tests.testbed --help`; docs/testing.md ("Multi-host
testbed")."""
