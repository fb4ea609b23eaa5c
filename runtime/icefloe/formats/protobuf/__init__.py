"""Protobuf: messages from registered `.proto` schemas, their compilation, and the AWS Glue Protobuf wire format."""
