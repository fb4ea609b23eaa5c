"""The EMR Serverless Spark application the tables' jobs run on."""

from __future__ import annotations

from dataclasses import dataclass, field

import pulumi
import pulumi_aws as aws

from .deployment import EmrSpec


@dataclass
class SparkApplicationArgs:
    spec: EmrSpec
    log_group_name: pulumi.Input[str]
    logs_uri: pulumi.Input[str]
    kms_key_arn: pulumi.Input[str]
    tags: dict[str, str] = field(default_factory=dict)


class SparkApplication(pulumi.ComponentResource):
    id: pulumi.Output[str]
    arn: pulumi.Output[str]

    def __init__(self, name: str, args: SparkApplicationArgs, opts: pulumi.ResourceOptions | None = None):
        super().__init__("icefloe:emr:SparkApplication", name, None, opts)
        spec = args.spec
        capacity = spec.maximum_capacity
        network = None
        if spec.subnet_ids:  # in a VPC to reach private brokers; needs NAT or endpoints for S3, Glue, KMS, logs
            network = aws.emrserverless.ApplicationNetworkConfigurationArgs(
                subnet_ids=list(spec.subnet_ids), security_group_ids=list(spec.security_group_ids)
            )
        image = (
            aws.emrserverless.ApplicationImageConfigurationArgs(image_uri=spec.image_uri) if spec.image_uri else None
        )
        monitoring = aws.emrserverless.ApplicationMonitoringConfigurationArgs(
            s3_monitoring_configuration=aws.emrserverless.ApplicationMonitoringConfigurationS3MonitoringConfigurationArgs(
                log_uri=args.logs_uri, encryption_key_arn=args.kms_key_arn
            ),
            cloudwatch_logging_configuration=aws.emrserverless.ApplicationMonitoringConfigurationCloudwatchLoggingConfigurationArgs(
                enabled=True, log_group_name=args.log_group_name, log_stream_name_prefix="icefloe"
            ),
        )
        self.application = aws.emrserverless.Application(
            f"{name}-spark",
            type="spark",
            release_label=spec.release_label,
            architecture=spec.architecture,
            # Started by the first job run, stopped after the idle timeout: no cost between refreshes.
            auto_start_configuration=aws.emrserverless.ApplicationAutoStartConfigurationArgs(enabled=True),
            auto_stop_configuration=aws.emrserverless.ApplicationAutoStopConfigurationArgs(
                enabled=True, idle_timeout_minutes=spec.idle_timeout_minutes
            ),
            maximum_capacity=aws.emrserverless.ApplicationMaximumCapacityArgs(
                cpu=capacity.cpu, memory=capacity.memory, disk=capacity.disk
            ),
            network_configuration=network,
            image_configuration=image,
            monitoring_configuration=monitoring,
            tags=args.tags,
            opts=pulumi.ResourceOptions(parent=self),
        )
        self.id = self.application.id
        self.arn = self.application.arn
        self.register_outputs({"id": self.id, "arn": self.arn})
