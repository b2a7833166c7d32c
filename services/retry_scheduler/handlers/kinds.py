"""Kinds of records on the internal ``…-inbox`` topic: the first byte of the value.

Dead letters, ticks and the HTTP API's commands all travel through the inbox, because a
table can only be changed by the handler that owns its partition: one partition's work
is serialised.
"""

KIND_DECIDED = b"D"  # a dead letter with its fate decided (entries.encode_decided)
KIND_DECIDED_PACK = b"P"  # several of them, in order (entries.pack_decided): one record per partition per route batch
KIND_LETTER = b"L"  # a dead letter not yet decided (an entry as stored), as earlier versions wrote
KIND_TICK = b"T"
KIND_REPLAY = b"R"
KIND_CANCEL = b"C"
KIND_UNPARK = b"U"
KIND_DELETE_PARKED = b"X"  # delete a parked message: never redelivered
COMMANDS = (KIND_REPLAY, KIND_CANCEL, KIND_UNPARK, KIND_DELETE_PARKED)
KIND_GROUP = b"G"  # replay or cancel the parked messages of a group in one partition
# Ordered retries (handlers/ordered.py): a dead letter of an ordered topic, placed by its lane;
# a consumer's acknowledgement of a head; an operator's command on a lane.
KIND_ORDERED = b"O"
KIND_ACK = b"A"
KIND_LANE = b"K"
