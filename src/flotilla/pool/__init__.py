"""Pure: the arbiter that shares one GPU pool between training and serving."""
