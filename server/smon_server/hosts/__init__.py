"""The fleet view: which hosts keep slowing jobs, from stored analyses and NVML samples."""
