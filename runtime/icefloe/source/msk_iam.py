"""Amazon MSK IAM authentication, for both of icefloe's Kafka clients, with the process's own AWS credentials.

MSK's IAM access control (`saslMechanism: AWS_MSK_IAM`) takes a SigV4-presigned `kafka-cluster:Connect` request
instead of a password, so there is no secret to store: on EMR the job role's credentials sign it.

- Python (librdkafka, for planning, `icefloe status` and the Python read path): SASL OAUTHBEARER with a token
  callback that signs with `aws-msk-iam-sasl-signer-python` (`MskIamToken`). The signer gives the expiry in
  **milliseconds**; confluent-kafka's `oauth_cb` must return **seconds** (nothing flags the wrong unit: a token
  "valid" for 1000x too long is refreshed never, and MSK drops the connection when the real one expires).
- JVM (Spark's Kafka source): the `software.amazon.msk:aws-msk-iam-auth` jar (pinned in jvm/pom.xml, shipped
  with every job) with the three settings its README documents (`JVM_OPTIONS`).
"""

from __future__ import annotations

from dataclasses import dataclass

from icefloe.errors import SourceError

# The jar's file name in jvm/lib/spark: local sessions load it only for MSK IAM clusters (its AWS SDK is unrelocated).
JAR_PREFIX = "aws-msk-iam-auth-"
# The librdkafka mechanism that carries MSK's IAM token.
OAUTHBEARER = "OAUTHBEARER"
# aws-msk-iam-auth's README, "Configuring a Kafka client to use AWS IAM", as Spark's Kafka source takes them.
JVM_OPTIONS = {
    "kafka.sasl.mechanism": "AWS_MSK_IAM",
    "kafka.sasl.jaas.config": "software.amazon.msk.auth.iam.IAMLoginModule required;",
    "kafka.sasl.client.callback.handler.class": "software.amazon.msk.auth.iam.IAMClientCallbackHandler",
}


@dataclass(frozen=True)
class MskIamToken:
    """confluent-kafka's `oauth_cb` for an MSK cluster in `region`: (token, expiry in seconds since the epoch).

    A plain dataclass so the client config pickles to Spark executors, which sign their own tokens."""

    region: str

    def __call__(self, _oauthbearer_config: str | None = None) -> tuple[str, float]:
        from aws_msk_iam_sasl_signer import MSKAuthTokenProvider

        try:
            token, expiry_ms = MSKAuthTokenProvider.generate_auth_token(self.region)
        except (AttributeError, ValueError):  # the signer's way of saying there are no credentials
            raise SourceError(
                f"MSK IAM authentication ({self.region}): no AWS credentials found (environment, profile or "
                "instance/job role) to sign the kafka-cluster:Connect token with"
            ) from None
        return token, expiry_ms / 1000
