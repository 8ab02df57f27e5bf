"""The application shell: what a user runs, wired from the layers below.

`cli/`: the `bass` command, one module per command group; `local.py`: everything in one
process (`bass generate`, benchmarks, tests); `launcher.py`: `bass serve`'s processes;
`client.py`: a Python client of the public Generation API; `demo.py`: `make demo`;
`humaneval_problems.py`: HumanEval's problems (the prompts of benchmarks, the demo and the
evaluation); `bench/`: measurements; `evaluation/`: HumanEval within time budgets;
`models/`: fetching the model pair and GGUF conversion.
"""
