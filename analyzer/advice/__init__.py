"""What a run found, for people and the router: the summary, its stored form, the report, its text and the
drill-down's marks."""
