"""The worker side: the ParamServer plugin, the shard runner, and the stores of partitions, shards and
pulled rows."""
