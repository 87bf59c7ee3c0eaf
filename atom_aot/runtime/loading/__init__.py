"""From an artifact on disk to callable forwards: checks, compiled packages, weights mapped to the device."""
