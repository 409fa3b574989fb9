"""Small-scale reproductions of the seed methods' headline effects (issue 16); see docs/experiments.md.

One script per claim (`python -m experiments.<name>`), each writing a PNG and a markdown table into
docs/experiments/; `experiments.common` holds what they share (seed statistics, tables, plots).
"""
