"""Evaluation: central test scores, the membership-inference audit, the backdoor check."""
