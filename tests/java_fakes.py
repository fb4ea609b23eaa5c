"""Stand-ins for the Py4J objects of a Java exception, for the checks that read its class, cause and codes."""

from __future__ import annotations


class FakeClass:
    def __init__(self, names: list[str]):
        self.names = names

    def getName(self):
        return self.names[0]

    def getSuperclass(self):
        return FakeClass(self.names[1:]) if len(self.names) > 1 else None


class FakeThrowable:
    """What Py4J gives for a Java exception: its class (with superclasses), cause and the methods the checks call."""

    def __init__(self, names: list[str], cause=None, **methods):
        self.names, self.cause, self.methods = names, cause, methods

    def getClass(self):
        return FakeClass(self.names)

    def getCause(self):
        return self.cause

    def equals(self, other):
        return other is self

    def __getattr__(self, name):
        value = self.__dict__["methods"][name]
        return lambda: value


def thrown_by_jvm(throwable) -> Exception:
    """An error as a Py4J call raises it, its text naming no transient word."""
    error = RuntimeError("An error occurred while calling o42.commit")
    error.java_exception = throwable  # type: ignore[attr-defined]
    return error


class FakeFrame:
    def __init__(self, class_name: str):
        self.class_name = class_name

    def getClassName(self):
        return self.class_name
