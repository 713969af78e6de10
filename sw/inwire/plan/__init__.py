"""The co-designed planner: topologies, aggregator profiles, the cost model, mixing, baselines, the
optimizer and the schedule file. docs/schedule.md describes the model; `inwire schedule` runs it.

    topology       cities, links, routes (networkx)
    aggregator     what an in-line aggregator can carry: ports and core rate, named or from a build report
    cost           round times of cliques: links and aggregators as resources, reduction trees, routing
    mixing         the period's averaging product, its norm and spectral radius
    baselines      global, ring, 2D grid, exponential gossip and the rest; the lower bound
    search         scoring schedules and the optimizer
    schedule_file  the schedule JSON: writing it, loading it as one object, the readable table
    errors         ScheduleError, below all of them (an InwireError and a ValueError)
"""
