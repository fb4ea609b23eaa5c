"""Pulumi resource type tokens the rules look at (pulumi-aws 7.x).

pulumi-aws 7 renamed the S3 `*V2` resources back to their plain names but still ships the V2 tokens as
aliases, so a program may register either; the rules accept both.
"""

BUCKET = frozenset({"aws:s3/bucket:Bucket", "aws:s3/bucketV2:BucketV2"})
BUCKET_SSE = frozenset(
    {
        "aws:s3/bucketServerSideEncryptionConfiguration:BucketServerSideEncryptionConfiguration",
        "aws:s3/bucketServerSideEncryptionConfigurationV2:BucketServerSideEncryptionConfigurationV2",
    }
)
BUCKET_VERSIONING = frozenset(
    {
        "aws:s3/bucketVersioning:BucketVersioning",
        "aws:s3/bucketVersioningV2:BucketVersioningV2",
    }
)
BUCKET_PUBLIC_ACCESS_BLOCK = frozenset({"aws:s3/bucketPublicAccessBlock:BucketPublicAccessBlock"})
BUCKET_POLICY = frozenset({"aws:s3/bucketPolicy:BucketPolicy"})
BUCKET_ACL = frozenset({"aws:s3/bucketAcl:BucketAcl", "aws:s3/bucketAclV2:BucketAclV2"})
BUCKET_OWNERSHIP_CONTROLS = frozenset({"aws:s3/bucketOwnershipControls:BucketOwnershipControls"})
BUCKET_OBJECT = frozenset({"aws:s3/bucketObject:BucketObject", "aws:s3/bucketObjectv2:BucketObjectv2"})

KMS_KEY = "aws:kms/key:Key"
KMS_KEY_POLICY = "aws:kms/keyPolicy:KeyPolicy"
SQS_QUEUE = "aws:sqs/queue:Queue"
SQS_QUEUE_POLICY = "aws:sqs/queuePolicy:QueuePolicy"
SECRET = "aws:secretsmanager/secret:Secret"
SECRET_POLICY = "aws:secretsmanager/secretPolicy:SecretPolicy"
GLUE_RESOURCE_POLICY = "aws:glue/resourcePolicy:ResourcePolicy"

IAM_ROLE = "aws:iam/role:Role"
IAM_ROLE_POLICY = "aws:iam/rolePolicy:RolePolicy"
IAM_POLICY = "aws:iam/policy:Policy"
IAM_USER_POLICY = "aws:iam/userPolicy:UserPolicy"
IAM_GROUP_POLICY = "aws:iam/groupPolicy:GroupPolicy"
IAM_ROLE_POLICY_ATTACHMENT = "aws:iam/rolePolicyAttachment:RolePolicyAttachment"
IAM_ACCESS_KEY = "aws:iam/accessKey:AccessKey"
IAM_USER_LOGIN_PROFILE = "aws:iam/userLoginProfile:UserLoginProfile"
IAM_SERVICE_SPECIFIC_CREDENTIAL = "aws:iam/serviceSpecificCredential:ServiceSpecificCredential"

EMR_SERVERLESS_APPLICATION = "aws:emrserverless/application:Application"
SCHEDULE = "aws:scheduler/schedule:Schedule"
EVENT_TARGET = "aws:cloudwatch/eventTarget:EventTarget"
LOG_GROUP = "aws:cloudwatch/logGroup:LogGroup"
GLUE_DATABASE = "aws:glue/catalogDatabase:CatalogDatabase"
GLUE_JOB = "aws:glue/job:Job"
LAMBDA_FUNCTION = "aws:lambda/function:Function"
ECS_TASK_DEFINITION = "aws:ecs/taskDefinition:TaskDefinition"
