"""The floor every layer may use: atomic files, run metadata, every NPDDP_ variable, plugins, tracing, and what one
process knows of itself -- where it stands in the job (env), its cores and BLAS threads (threads), the guard that
ends the whole job when it fails (guard)."""
