"""Glue databases, one per source cluster, where the runtime creates its Iceberg tables."""

from __future__ import annotations

from dataclasses import dataclass, field

import pulumi
import pulumi_aws as aws


@dataclass
class GlueDatabasesArgs:
    names: list[str]
    warehouse_uri: pulumi.Input[str]
    delete_tables_on_destroy: bool = False
    tags: dict[str, str] = field(default_factory=dict)


class GlueDatabases(pulumi.ComponentResource):
    def __init__(self, name: str, args: GlueDatabasesArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("icefloe:glue:GlueDatabases", name, None, opts)
        # Deleting a Glue database deletes its tables; the runtime's tables outlive the stack unless opted in.
        keep = pulumi.ResourceOptions(parent=self, retain_on_delete=not args.delete_tables_on_destroy)
        self.databases = {
            db: aws.glue.CatalogDatabase(
                f"{name}-{db}",
                name=db,
                description="icefloe: Iceberg tables materialized from Kafka",
                location_uri=pulumi.Output.from_input(args.warehouse_uri).apply(lambda uri, d=db: f"{uri}/{d}.db"),  # type: ignore[misc]  # a lambda binding the loop variable as a default
                tags=args.tags,
                opts=keep,
            )
            for db in args.names
        }
        self.register_outputs({"databases": list(self.databases)})
