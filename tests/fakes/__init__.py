"""Stand-ins for GPU libraries and Linux sysfs trees, for tests that run without a GPU."""
