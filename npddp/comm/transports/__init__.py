"""The Transport seam that moves bytes between ranks: MPI point-to-point or TCP sockets, and the TCP rendezvous."""
