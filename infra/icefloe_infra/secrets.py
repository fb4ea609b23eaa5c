"""Kafka and Schema Registry credentials: referenced by Secrets Manager ARN, or created from Pulumi secrets.

Either way a job only ever sees the ARN (in its config object); the value lives in Secrets Manager, encrypted
with the stack's key, and in Pulumi state as a secret.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pulumi
import pulumi_aws as aws

from icefloe.spec import IcefloeConfig

from .deployment import SecretSpec


def referenced_secret_arns(spec: IcefloeConfig) -> list[str]:
    """Existing secrets the clusters point at by ARN: credentials and TLS material (CA, client certificate, key,
    key password) of clusters and registries, and a REST catalog's credential or token. The job role may read exactly
    these, plus the created ones."""
    arns = []
    for cluster in spec.source_clusters:
        registry = cluster.schema_registry
        refs = [cluster.credentials_secret, *(cluster.tls.references().values() if cluster.tls else ())]
        if registry is not None:
            refs += [registry.credentials_secret, *(registry.tls.references().values() if registry.tls else ())]
        for ref in refs:
            if ref is not None and ref.secret_arn and ref.secret_arn not in arns:
                arns.append(ref.secret_arn)
    for ref in spec.catalog.secret_refs:
        if ref.secret_arn and ref.secret_arn not in arns:
            arns.append(ref.secret_arn)
    return arns


@dataclass
class StackSecretsArgs:
    secrets: dict[str, SecretSpec]
    kms_key_arn: pulumi.Input[str]
    tags: dict[str, str] = field(default_factory=dict)


class StackSecrets(pulumi.ComponentResource):
    arns: dict[str, pulumi.Output[str]]

    def __init__(self, name: str, args: StackSecretsArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("icefloe:secrets:StackSecrets", name, None, opts)
        self.arns = {}
        for key, spec in args.secrets.items():
            secret = aws.secretsmanager.Secret(
                f"{name}-{key}",
                description=f"icefloe: credentials '{key}' (username, password)",
                kms_key_id=args.kms_key_arn,
                recovery_window_in_days=7,
                tags=args.tags,
                opts=pulumi.ResourceOptions(parent=self),
            )
            value = pulumi.Output.json_dumps({"username": spec.username, "password": spec.password.get_secret_value()})
            aws.secretsmanager.SecretVersion(
                f"{name}-{key}-value",
                secret_id=secret.id,
                # Marked secret: encrypted in Pulumi state, masked in the CLI's output and in stack outputs.
                secret_string=pulumi.Output.secret(value),  # type: ignore[arg-type]  # Output.secret's T is inferred from the parameter, not the argument
                opts=pulumi.ResourceOptions(parent=self),
            )
            self.arns[key] = secret.arn
        self.register_outputs({"arns": self.arns})
