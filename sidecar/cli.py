"""The `shale` command: one entry point, one sub-command per job."""

from __future__ import annotations

import argparse
import logging
import sys

DUMP_LOG_DIFFERENCES = """\
exit status: 0 when every file was read and every check agreed; 1 on corrupt data, an index that
disagrees with its log, or a file that is not what its name says (Kafka's tool exits 1 only when
it crashes on such a file, with a stack trace; it exits 0 after reporting findings); 2, before
anything is dumped, for a missing file, a directory, or a segment name without its base offset.

Findings that describe files Kafka itself writes are reported in Kafka's words but do not fail the
exit status: .timeindex entries that point inside a batch, at the record with the largest
timestamp (Kafka 2.x-3.6 wrote them), and .index entries that map a later batch's last offset to
an earlier batch's position (one entry per multi-batch append: followers' and the cleaner's
segments before KAFKA-806, Kafka 4.1). Lookups through both are correct.

KRaft control records print as Kafka's current tool prints them: SnapshotHeader, SnapshotFooter,
KRaftVersion, KRaftVoters (Kafka 3.3+) and LeaderChange (Kafka 3.x printed controlType:
LEADER_CHANGE(2)) as the JSON of their values.

Also unlike Kafka's tool: a preallocated .index or .timeindex that holds no entry yet (an active
segment) is empty, not an entry for offset 0; a .timeindex entry at a batch the cleaner emptied
(kept for its producer) is checked against the batch's own max timestamp, which Kafka's cleaner
indexed, not against the -1 of a batch without records; checkpoint files and partition.metadata
are dumped; .txnindex files are checked too (--index-sanity-check: Kafka's sanity and append rules;
--verify-index-only: also each entry's ABORT marker in the .log); a corrupt or unknown batch is named
with its position instead of a stack trace;
message format v0/v1 (Kafka before 0.11) is reported as corrupt, not decoded; there is no --files
(files are arguments), and no decoder options: keys and payloads print as UTF-8 text, Kafka's
default, and KRaft metadata records print as that text too (Kafka's --cluster-metadata-decoder is
absent)."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="shale", description="Kafka-compatible, compacted log storage.")
    parser.add_argument("--log-level", default="INFO", help="logging level (default INFO)")
    sub = parser.add_subparsers(dest="command", required=True)

    dump = sub.add_parser("dump-log", help="print .log/.index/.timeindex/checkpoint files like kafka-dump-log.sh",
                          description="Print Kafka's (and Shale's) segment, index, snapshot and checkpoint files "
                                      "in the line format of Kafka's kafka-dump-log.sh, and check index files "
                                      "against their log.",
                          epilog="Differences from kafka-dump-log.sh\n\n" + DUMP_LOG_DIFFERENCES,
                          formatter_class=argparse.RawDescriptionHelpFormatter)
    dump.add_argument("files", nargs="+", metavar="FILE")
    dump.add_argument("--print-data-log", action="store_true", help="print every record's key and value")
    dump.add_argument("--deep-iteration", action="store_true", help="print one line per record")
    dump.add_argument("--verify-index-only", action="store_true", help="only check index files against their log")
    dump.add_argument("--index-sanity-check", action="store_true", help="only run the sanity checks of index files")
    dump.add_argument("--max-bytes", type=int, default=None, help="read at most this many bytes of a .log")

    demo = sub.add_parser("demo", help="start shale serve locally and replay the latest-product-price walkthrough")
    demo.add_argument("--workdir", default="demo-data", help="holds the topic manifest and the data directory")
    demo.add_argument("--listen", default="127.0.0.1:9092", metavar="HOST:PORT")
    demo.add_argument("--http", default="127.0.0.1:8080", metavar="HOST:PORT")
    demo.add_argument("--exit", action="store_true", help="stop the server after the walkthrough")

    serve = sub.add_parser("serve", help="run a storage node: the Kafka protocol over a data directory")
    serve.add_argument("--data-dir", required=True, action="append",
                       help="a log directory (created if missing); repeat it or give a comma-separated list for "
                            "several volumes (JBOD, docs/moves.md); node files live in the first")
    serve.add_argument("--topics", required=True, metavar="PATH",
                       help="a Topic manifest file or a directory of them (watched for changes)")
    serve.add_argument("--listen", default="127.0.0.1:9092", metavar="HOST:PORT", help="Kafka listener")
    serve.add_argument("--http", default="127.0.0.1:8080", metavar="HOST:PORT",
                       help="/metrics, /status, /healthz, /readyz")
    serve.add_argument("--http-token-file", default=None, metavar="PATH",
                       help="a file holding the bearer token every HTTP change (pause/resume) must present; "
                            "read per request (mount it from a Secret)")
    serve.add_argument("--http-tls-cert", default=None, metavar="PEM", help="TLS on the HTTP port: certificate chain")
    serve.add_argument("--http-tls-key", default=None, metavar="PEM", help="TLS on the HTTP port: private key")
    serve.add_argument("--http-tls-ca", default=None, metavar="PEM",
                       help="CA of client certificates: a verified one authenticates HTTP changes (mTLS)")
    serve.add_argument("--http-tls-client-auth", default=None, choices=("required", "requested", "none"),
                       help="as Kafka's ssl.client.auth (default: requested with --http-tls-ca, else none)")
    serve.add_argument("--advertised-host", default=None, help="host name clients are told to connect to")
    serve.add_argument("--advertised-port", type=int, default=None,
                       help="port clients are told to connect to (default: the --listen port)")
    serve.add_argument("--node-id", type=int, default=0)
    serve.add_argument("--store", default=None, metavar="etcd://HOST:PORT[,HOST:PORT]|kubernetes",
                       help="the control store of a replicated cluster (docs/replication.md); without it the "
                            "node runs alone, every partition with one replica")
    serve.add_argument("--cluster-id", default="shale",
                       help="the cluster's name: the store's key prefix, Metadata's cluster id")
    serve.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                       help="a broker config, e.g. log.cleaner.threads=2 (repeatable, as kafka-server-start)")

    scram = sub.add_parser("scram-credential", help="seed a SCRAM credential into a data directory (node stopped)",
                           description="Write a user's salted SCRAM credential into DATA_DIR/shale-security.json, "
                                       "for the first SASL user (Kafka's kafka-storage format --add-scram). The node "
                                       "must not be running; on a running node use AlterUserScramCredentials.")
    scram.add_argument("--data-dir", required=True, help="the node's log directory")
    scram.add_argument("--user", required=True)
    scram.add_argument("--password-file", required=True, metavar="PATH",
                       help="a file holding the password (its trailing newline is not part of it)")
    scram.add_argument("--mechanism", default="SCRAM-SHA-512", choices=("SCRAM-SHA-256", "SCRAM-SHA-512"))
    scram.add_argument("--iterations", type=int, default=4096, help="4096..16384 (Kafka's bounds)")

    crd = sub.add_parser("crd", help="print (or write) the Topic CRD, generated from the topic-config table, "
                                     "or the User CRD")
    crd.add_argument("--kind", choices=("topic", "user"), default="topic", help="which CRD (default: topic)")
    crd.add_argument("-o", "--output", action="append", default=[], metavar="FILE",
                     help="write the CRD to FILE instead of stdout (repeatable)")

    operator = sub.add_parser("operator", help="run the kopf operator: Topic resources -> the storage pods' topics")
    from shale.operator.settings import add_arguments as add_operator_arguments

    add_operator_arguments(operator)

    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        stream=sys.stderr)
    if args.command == "dump-log":
        from .dump_log import dump_files

        return dump_files(args.files, print_data=args.print_data_log, deep_iteration=args.deep_iteration,
                          verify_index_only=args.verify_index_only, index_sanity_check=args.index_sanity_check,
                          max_bytes=args.max_bytes, out=sys.stdout, err=sys.stderr)
    if args.command == "demo":
        from .demo import run_demo

        return run_demo(args.workdir, out=sys.stdout, listen=args.listen, http=args.http, keep_serving=not args.exit)
    if args.command == "serve":
        from .server.serve import serve_forever

        return serve_forever(args)
    if args.command == "scram-credential":
        from .scram_credential import CredentialError, read_password, set_credential

        try:
            path = set_credential(args.data_dir, args.user, read_password(args.password_file), args.mechanism,
                                  args.iterations)
        except (CredentialError, ValueError) as exc:
            logging.getLogger("shale").error("scram-credential: %s", exc)
            return 1
        logging.getLogger("shale").info("%s credential of user %r written to %s", args.mechanism, args.user, path)
        return 0
    if args.command == "operator":
        from shale.operator.main import main as operator_main

        return operator_main(args)
    if args.command == "crd":
        from shale.operator.crd import main as crd_main

        return crd_main(args.output, args.kind)
    parser.error(f"unknown command {args.command}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
