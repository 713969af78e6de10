"""Schedule files for the stream tests: five islands of doublezero9, a period of three rounds."""

import json

ISLANDS = ["SIN", "TYO", "SEO", "LAX", "NYC"]
PERIOD = [
    [{"members": ["SIN", "TYO", "SEO"], "aggregator": "TYO"}, {"members": ["LAX", "NYC"], "aggregator": "LAX"}],
    [{"members": ["SIN", "LAX"], "aggregator": "SIN"}, {"members": ["TYO", "SEO", "NYC"], "aggregator": "SEO"}],
    [{"members": ["SIN", "TYO", "SEO", "LAX", "NYC"], "aggregator": "NYC"}],
]


def write_schedule(path, rounds=PERIOD, islands=ISLANDS, topology="doublezero9"):
    document = {"topology": topology, "islands": islands, "model_bytes": 4096, "epsilon": 1e-3,
                "rounds": [{"cliques": cliques, "time_ms": 100.0} for cliques in rounds], "period_ms": 300.0,
                "rho": 0.5, "time_to_epsilon_ms": 3000.0, "baselines": {}, "lower_bound_ms": 10.0}
    path.write_text(json.dumps(document))
    return path
