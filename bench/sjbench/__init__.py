"""simjoin benchmark harness: workloads, peers, the simjoin runner, reports."""
