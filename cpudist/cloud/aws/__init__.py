"""AWS EC2 with boto3: the same code runs against AWS and any EC2-compatible endpoint."""
