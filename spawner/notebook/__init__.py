"""What runs inside the notebook images: the GPU monitor extension, the preemption
checkpoint helpers and the PyTorch memory cap. Kept empty: every Python process of a
server imports this package (docs/architecture.md#what-the-images-import)."""
