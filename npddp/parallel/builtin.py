"""The comm hook registry's former address, kept so plugins that import it still work: :mod:`npddp.parallel.hook_registry`."""

from npddp.parallel.hook_registry import (HOOKS, HookFactory, build, build_comm_hook, comm_hook_help, comm_hook_names,
                                          register_comm_hook_factory)

__all__ = ["HOOKS", "HookFactory", "build", "build_comm_hook", "comm_hook_help", "comm_hook_names",
           "register_comm_hook_factory"]
