"""How transactions are refused: at once, with a code every client takes as final.

compactlog has no transaction coordinator. A transactional producer first asks for one
(FindCoordinator with key type 1), then for a producer id (InitProducerId with its
transactional id). Both get TRANSACTIONAL_ID_AUTHORIZATION_FAILED (53): it is the code
that fails `init_transactions()` at once in every client checked, where the others make
librdkafka retry until the call times out (transaction.timeout.ms, 60 s by default):

- librdkafka (rdkafka_txnmgr.c rd_kafka_txn_handle_FindCoordinator): only 53 and
  CLUSTER_AUTHORIZATION_FAILED (31) raise a fatal error; any other code, INVALID_REQUEST
  and UNSUPPORTED_VERSION included, clears the coordinator and queries again. For
  InitProducerId (rdkafka_idempotence.c rd_kafka_idemp_check_error) the fatal ones
  are 53, 31 and INVALID_TRANSACTION_TIMEOUT; the rest are retried every 500 ms. Its
  fatal error quotes FindCoordinator's error message (v1+), which says why.
- kafka-python 3 (producer/transaction_manager.py): 53 is a fatal
  TransactionalIdAuthorizationFailedError; any non-retriable code is fatal too, but
  as an "unexpected error".
- aiokafka (producer/sender.py `_find_coordinator`): 53 raises
  TransactionalIdAuthorizationFailed from `start()`; others a generic KafkaError.

Kafka's own broker gives 53 to a transactional id the client may not use
(KafkaApis.getCoordinator, handleInitProducerIdRequest); it has no "transactions off"
code (for share groups without a coordinator it answers INVALID_REQUEST, which
librdkafka would retry). 31 would name the cluster, not transactions. The message
says that this is not an authorization problem.
"""

from __future__ import annotations

import logging

from kio.schema.errors import ErrorCode

from compactlog.log_throttle import Throttle, held_back
from compactlog.server.protocol.messages import Request

log = logging.getLogger("compactlog.server")

TRANSACTIONS_REFUSED = ErrorCode.transactional_id_authorization_failed
NOT_SUPPORTED = (
    "transactions are not supported by compactlog yet: there is no transaction "
    "coordinator (not an authorization problem); produce without a transactional id "
    "(idempotent producers work)"
)
# A client that asks once per start (or an application restarted in a loop) gets one
# line per minute.
_ASKED = Throttle(60.0)


def log_refusal(request: Request, transactional_id: str) -> None:
    """One INFO line per client (client id and address) per minute."""
    held = _ASKED.allow((request.client_id, request.client_host))
    if held is None:
        return
    log.info("transactions refused for client id %r at %s (%s, transactional id %r): "
             "compactlog does not support transactions yet; the client gets "
             "TRANSACTIONAL_ID_AUTHORIZATION_FAILED%s", request.client_id,
             request.client_host or "?", request.name, transactional_id, held_back(held))
