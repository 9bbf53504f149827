"""AWS errors as one-line CpudistErrors that keep the AWS code and say what to do."""

from __future__ import annotations

import botocore.exceptions
from botocore.parsers import ResponseParserError

from cpudist.errors import BadInput, CpudistError

HINTS = {
    "InsufficientInstanceCapacity": "Try another instance type or availability zone (--subnet), "
                                    "or pass --on-demand-fallback",
    "SpotMaxPriceTooLow": "Raise --max-price, leave it out (pay up to on-demand), or use "
                          "--on-demand",
    "MaxSpotInstanceCountExceeded": "Ask AWS for a higher spot quota, use fewer --nodes, or "
                                    "--on-demand",
    "RequestLimitExceeded": "AWS is throttling this account: wait a minute and re-run (it "
                            "converges)",
    "UnauthorizedOperation": "Grant these credentials the permissions in "
                             "cpudist/cloud/aws/iam-policy.json (README)",
    "InvalidAMIID.NotFound": "Check --image and --region: AMIs are regional",
    "InvalidAMIID.Malformed": "An AMI id looks like ami-0123456789abcdef0",
    "InvalidInstanceType": "Check --instance-type for this region",
    "InvalidKeyPair.NotFound": "Check --key-name, or leave it out to let cpudist make one",
    "AuthFailure": "Check the AWS credentials (aws configure)",
    "InvalidClientTokenId": "Check the AWS credentials (aws configure)",
    "VcpuLimitExceeded": "Ask AWS for a higher vCPU quota, or use fewer/smaller instances",
}
# Bad input or bad setup (exit 2, as the CLI's own checks): what the user must change, not a job
# that failed. Credentials AWS does not know or cannot verify are setup, as missing ones are.
BAD_INPUT_PREFIXES = ("InvalidAMIID", "InvalidInstanceType", "InvalidKeyPair", "InvalidParameter",
                      "InvalidSubnet",
                      "AuthFailure", "InvalidClientTokenId", "SignatureDoesNotMatch")


class AwsError(CpudistError):
    """An AWS call failed; `code` keeps AWS's error code."""

    def __init__(self, message: str, hint: str | None = None, code: str = "") -> None:
        super().__init__(message, hint)
        self.code = code


class AwsBadInput(AwsError, BadInput):
    """AWS refused an input of ours (image, type, key): exit code 2."""


def translate(e: Exception) -> CpudistError:
    """The CpudistError for a botocore exception."""
    if isinstance(e, botocore.exceptions.NoCredentialsError
                  | botocore.exceptions.PartialCredentialsError):
        return AwsBadInput("no AWS credentials found",
                        "Run `aws configure`, or set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or "
                        "AWS_PROFILE",
                        "NoCredentials")
    if isinstance(e, ResponseParserError):  # an HTML page, or another API, where EC2 should be
        return AwsBadInput(f"the endpoint did not answer like EC2 ({type(e).__name__})",
                           "Check --endpoint-url (AWS_ENDPOINT_URL): it must be "
                           "an EC2 API endpoint",
                           type(e).__name__)
    if isinstance(e, botocore.exceptions.EndpointConnectionError):
        return AwsError(f"cannot reach the EC2 endpoint ({e})",
                        "Check --region/--endpoint-url (AWS_ENDPOINT_URL) and the network",
                        "EndpointConnectionError")
    if isinstance(e, botocore.exceptions.ClientError):
        err = e.response.get("Error", {})
        code, message = err.get("Code", "Unknown"), err.get("Message", str(e))
        op = e.operation_name
        hint = HINTS.get(code) or next((h for k, h in HINTS.items() if code.startswith(k)), None)
        cls = AwsBadInput if code.startswith(BAD_INPUT_PREFIXES) else AwsError
        return cls(f"AWS {op} failed: {code}: {message}", hint
                   or "See the AWS documentation for this code", code)
    return AwsError(f"AWS call failed: {e}", "Re-run with --debug for details", type(e).__name__)
