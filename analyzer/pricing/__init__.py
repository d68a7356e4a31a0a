"""From acceptance and cost to speedup: the closed form, the policy curve and its one decision rule, and
the cost profiles a run is priced with."""
