"""Training: Ray Train + DeepSpeed stages (pretrain, pair, triplet, contextual, diffretriever) over the encoder core."""
