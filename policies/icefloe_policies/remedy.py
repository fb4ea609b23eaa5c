"""One shape for every violation message: what is wrong, then how to fix it."""


def message(problem: str, fix: str) -> str:
    return f"{problem} Fix: {fix}"
