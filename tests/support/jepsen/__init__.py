"""A concurrency harness in the manner of Jepsen (issue 21): real processes on loopback,
faults chosen at random from a seed, and a checker over what every client saw.

Two or three `compactlog serve` processes (nodes) share one s3:// URL on moto's server,
behind the project's S3 fault proxy (tests/support/s3_faults.py); each has its own local
directory and port. Producers with acks=all and acks=1, each pinned to one node, record
every acknowledgement; consumer groups, pinned too, record what they read and commit;
DeleteRecords, config changes and `compactlog compact` from outside run now and then;
the nodes' own cleaners, merges and retention run as upkeep does them. A nemesis kills
(SIGKILL), pauses (SIGSTOP past the lease), restarts nodes on their old directories,
fails, stalls and loses S3 requests, slows the lease renewal and fills local disks.
After the run the checker reads the final log and every read path and checks the
contract (DESIGN.md items 2, 3, 5, 12, 13, 14).

Modules:
  history   what the clients and the nemesis did, with wall-clock times
  cluster   the nodes: processes, local directories (a tmpfs each, for a full disk),
            logs, and the writer-lease ownership the logs tell
  clients   producers, consumer groups, admin operations, `compactlog compact`
  nemesis   the seeded schedule of faults and operations, and its execution
  final     the log and the compacted views after the run, from every read path
  checker   the checks, their counts and the violations
  run       one schedule from start to check
"""
