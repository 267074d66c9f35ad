"""The eddyline operator."""
