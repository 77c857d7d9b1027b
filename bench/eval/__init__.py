"""speed and acceptance on the paper's six evaluation sets (benchmark only: never train or tune on them)."""
