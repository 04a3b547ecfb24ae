"""Measuring: the shape grid (grid), the plan of what to measure and the session that measures
it (tuner), the capability and parity gates (gates), the timing harness (harness), the parity and
timing tasks (tasks) and the worker processes that run them isolated (worker) on one device,
several (devices) or a Ray cluster (cluster), the search of tunable kernels' parameters (search),
the first calls made ahead (ahead) and the machine's state with every record (env)."""
