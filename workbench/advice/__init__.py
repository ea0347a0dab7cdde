"""The advisor's parts: core (thresholds, Finding, Measurements), the rules by theme (training, generation,
placement, crash), the session record (memory model, failures, plan in force) and the safety screen.
workbench.advisor is the face that runs them."""
