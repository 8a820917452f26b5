"""The README's and docs/'s code blocks and the docstrings' examples, run for real."""
