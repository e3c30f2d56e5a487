"""``pyverbs.providers.mlx5``: mlx5 direct verbs (softverbs is not an mlx5 device)."""
