"""Estimates of the GPU memory a workload needs, under vramkit and under other allocators."""
