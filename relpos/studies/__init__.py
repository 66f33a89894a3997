"""Study tools: sweeps with seeds and significance, breakdowns, plots and figures."""
