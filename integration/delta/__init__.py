"""DeltaSink against real Delta tables, local and on ``s3a://`` (the S3 service)."""
