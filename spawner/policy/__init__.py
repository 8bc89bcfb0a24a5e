"""What a role becomes, for any backend: the quota's choices and settings, the
container's environment, labels and GPU caps, and the final check's rules. Imports
neither docker nor kubernetes (``make lint`` checks it)."""
