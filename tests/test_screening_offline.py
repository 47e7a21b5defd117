"""An error reply of the SuperLink for an offline node is that node's dropout.

Seen across separate hosts (tests/test_hosts.py): a SuperNode whose link was
down is marked offline, and Flower's SuperLink answers the next message to it
itself, from its own node id (1), with ``reply_to_message_id`` = the message's
id. It used to be recorded as "partition None (node 1) rejected: reply from a
node not asked".
"""

from flwr.app import Error, Message, RecordDict

from server_app.rounds.screening import FaultLog, screen

SUPERLINK = 1


def _pushed(node: int) -> Message:
    message = Message(RecordDict(), dst_node_id=node, message_type="train")
    message.metadata.__dict__["_message_id"] = message.object_id  # as Flower's push
    return message


def _superlink_error(sent: Message) -> Message:
    """An error reply from the SuperLink's node id, in reply to ``sent``."""
    stand_in = Message(RecordDict(), dst_node_id=SUPERLINK, message_type="train")
    stand_in.metadata.__dict__["_message_id"] = sent.metadata.message_id
    return Message(error=Error(code=3, reason="Error: Node Unavailable"),
                   reply_to=stand_in)


def test_superlink_error_reply_is_a_dropout_of_its_node():
    sent = [_pushed(7), _pushed(8)]
    faults = FaultLog()
    kept = screen([_superlink_error(sent[0])], sent, "sharded", 3, faults, {7: 2, 8: 0})
    assert kept == []
    entries = sorted(faults.entries, key=lambda f: f["node"])
    assert [(f["node"], f["partition"], f["kind"]) for f in entries] == \
        [(7, 2, "dropout"), (8, 0, "dropout")]
    assert entries[0]["reason"] == "unreachable: Error: Node Unavailable"
    assert entries[1]["reason"] == "no answer within the round timeout"


def test_an_error_reply_for_no_sent_message_is_still_rejected():
    sent = [_pushed(7)]
    stray = _superlink_error(_pushed(9))
    faults = FaultLog()
    screen([stray], sent, "sharded", 1, faults, {7: 0})
    kinds = sorted((f["node"], f["kind"]) for f in faults.entries)
    assert kinds == [(SUPERLINK, "rejected"), (7, "dropout")]


def test_a_client_cannot_answer_for_another_node():
    """A SuperNode's error reply naming node 7's message is its own stray reply."""
    sent = [_pushed(7)]
    forged = _superlink_error(sent[0])
    forged.metadata.__dict__["_src_node_id"] = 9  # a client, not the SuperLink
    faults = FaultLog()
    screen([forged], sent, "sharded", 1, faults, {7: 0, 9: 1})
    kinds = sorted((f["node"], f["kind"], f["reason"]) for f in faults.entries)
    assert kinds == [(7, "dropout", "no answer within the round timeout"),
                     (9, "rejected", "reply from a node not asked")]
