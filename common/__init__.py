"""The ground floor: helpers every other folder uses (atomic files and storage errors, stopping on signals and
with the parent process, addresses, progress lines). It imports nothing of rlfleet."""
