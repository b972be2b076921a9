"""What runs the model: the priority scheduler and its jobs, the model lifecycle, metrics."""
