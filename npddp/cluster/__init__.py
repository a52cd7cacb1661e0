"""A cluster on one machine: emulated nodes (network and UTS namespaces) on shaped links, and jobs across them."""
