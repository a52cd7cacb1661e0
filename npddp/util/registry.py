"""Names -> entries of one kind (algorithms, transports, comm hooks, models): the one registry every plugin point uses."""

from __future__ import annotations

from collections.abc import Iterator

from npddp.util.shown import shown


class Registry:
    """Entries by name in registration order; a bad, taken or unknown name is a ValueError naming the valid ones."""

    def __init__(self, kind: str, reserved: tuple = ()):
        self.kind = kind
        self.reserved = tuple(reserved)   # names taken by something else (not registrable here)
        self._entries: dict = {}

    def add(self, name: str, entry, replace: bool = False) -> None:
        """Register ``entry`` as ``name``: an identifier not taken yet (``replace``: or taken by an earlier entry)."""
        if not (isinstance(name, str) and name.isidentifier()) or name in self.reserved:
            other = f" other than {', '.join(map(repr, self.reserved))}" if self.reserved else ""
            raise ValueError(f"{self.kind} name {shown(name)} must be a Python identifier (letters, digits, _){other}")
        if name in self._entries and not replace:
            raise ValueError(f"{self.kind} {name!r} is already registered; taken: {', '.join(self._entries)}")
        self._entries[name] = entry

    def remove(self, name: str) -> None:
        """Forget ``name`` (a test's temporary entry); KeyError when absent."""
        del self._entries[name]

    def get(self, name: str):
        """The entry called ``name``; ValueError naming the valid ones otherwise."""
        try:
            return self._entries[name]
        except (KeyError, TypeError):
            raise ValueError(f"unknown {self.kind} {shown(name)}; valid: {', '.join(self._entries)}") from None

    def names(self) -> tuple:
        """Every registered name, in registration order."""
        return tuple(self._entries)

    def items(self):
        """``(name, entry)`` pairs in registration order."""
        return self._entries.items()

    def __contains__(self, name) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)
