"""Hand-written all-reduce algorithms over a transport's point-to-point messages, and the engine that runs them."""
