"""The memory manager service: `quire.block.BlockManager` per executor behind gRPC."""
