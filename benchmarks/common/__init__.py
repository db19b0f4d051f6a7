"""What the benchmarks and the load test share: the workload, statistics and reports."""
