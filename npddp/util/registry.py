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

    def check(self, name, replace: bool = False) -> None:
        """ValueError unless ``name`` may be added: an identifier, not reserved, not taken (``replace``: or taken)."""
        if not (isinstance(name, str) and name.isidentifier()) or name in self.reserved:
            other = f" other than {', '.join(map(repr, self.reserved))}" if self.reserved else ""
            raise ValueError(f"{self.kind} name must be a Python identifier{other} (letters, digits, _), "
                             f"got {shown(name)}")
        if name in self._entries and not replace:
            raise ValueError(f"{self.kind} {name!r} is already registered; taken: {', '.join(self._entries)}")

    def add(self, name: str, entry, replace: bool = False) -> None:
        """Register ``entry`` as ``name`` (see :meth:`check`)."""
        self.check(name, replace)
        self._entries[name] = entry

    def copy(self) -> "Registry":
        """A registry of the same kind holding the same entries, changed apart from this one."""
        twin = Registry(self.kind, self.reserved)
        twin._entries = dict(self._entries)
        return twin

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
