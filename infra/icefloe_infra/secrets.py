"""Stack-created credentials: Secrets Manager secrets built from Pulumi secret config, referenced by ARN only."""

from __future__ import annotations

from dataclasses import dataclass, field

import pulumi
import pulumi_aws as aws

from .deployment import SecretSpec


@dataclass
class StackSecretsArgs:
    secrets: dict[str, SecretSpec]
    kms_key_arn: pulumi.Input[str]
    tags: dict[str, str] = field(default_factory=dict)


class StackSecrets(pulumi.ComponentResource):
    def __init__(self, name: str, args: StackSecretsArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("icefloe:secrets:StackSecrets", name, None, opts)
        self.arns: dict[str, pulumi.Output[str]] = {}
        for key, spec in args.secrets.items():
            secret = aws.secretsmanager.Secret(
                f"{name}-{key}", kms_key_id=args.kms_key_arn, recovery_window_in_days=7, tags=args.tags,
                opts=pulumi.ResourceOptions(parent=self),
            )  # fmt: skip
            aws.secretsmanager.SecretVersion(
                f"{name}-{key}-value",
                secret_id=secret.id,
                # Marked secret: encrypted in Pulumi state, masked in logs and outputs.
                secret_string=pulumi.Output.secret(pulumi.Output.json_dumps(
                    {"username": spec.username, "password": spec.password})),
                opts=pulumi.ResourceOptions(parent=self),
            )  # fmt: skip
            self.arns[key] = secret.arn
        self.register_outputs({"arns": self.arns})
