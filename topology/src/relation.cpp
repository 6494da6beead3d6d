// filled in by the topology core owner
