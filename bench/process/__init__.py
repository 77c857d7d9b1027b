"""whole moa-cpp generate processes, spawn to exit."""
