"""The kopf operator (`shale operator`): `Topic` custom resources → the storage pods' manifests and back.

It turns each `Topic` (group shale.dev) into a manifest in the one ConfigMap that every `shale serve`
pod of the storage StatefulSet watches, keeps the partitions' placement stable, and reports what the
pods' `/status` says (offsets, sizes, cleaning) in the Topic's status. See docs/operator.md.

Named `shale.operator` (folder `operator/`) so that it never shadows the standard library's `operator`.
"""
