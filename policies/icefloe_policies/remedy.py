"""One shape for every violation message: what is wrong, then how to fix it."""


def message(problem: str, fix: str) -> str:
    return f"{problem} Fix: {fix}"


def listing(items: list[str], most: int = 4) -> str:
    """The first `most` items, comma-separated, with ' ...' when there are more."""
    return ", ".join(items[:most]) + (" ..." if len(items) > most else "")
