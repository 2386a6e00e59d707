"""Tools that start servers and drive load against them: `adaflash sweep` (sweep.py, with Locust in tools/locust/
and NVIDIA's aiperf, aiperf_runs.py), the reliability suite (reliability.py) and the failover drill (failover.py).

They stand above the server, the core and the client library and import all three; none of those imports them.
"""
